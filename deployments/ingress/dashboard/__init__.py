"""The live edge map at GET /dashboard: its data (one admin endpoint), the world outline and the
static page the router serves from this package (no CDN, no build step)."""
