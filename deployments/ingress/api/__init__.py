"""The router's HTTP layer: one FastAPI `APIRouter` per API (OpenAI, Workers AI, admin, health),
thin (parse, call a service, shape the answer), and `make_app`, which puts them together."""
