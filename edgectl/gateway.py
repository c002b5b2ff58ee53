"""`edge keys create|list|revoke|rotate` and `edge usage`: the gateway's virtual keys and usage
totals through the router's admin API (docs/gateway-state.md). A new key's secret is printed
once, as the router shows it once."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from edge_sim.clock import Clock

HTTP_TIMEOUT_S = 10.0


class AdminError(Exception):
    """The router refused or did not answer; the message is its own (exit 1)."""


def admin_call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        raise AdminError(f"{client.base_url}: {error}") from None
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise AdminError(f"{method} {path}: {response.status_code} {message}")
    return response.json()


def new_key_body(args: argparse.Namespace, wall_clock: Clock) -> dict[str, Any]:
    """POST /admin/keys's body from `edge keys create`'s options."""
    body: dict[str, Any] = {"name": args.name, "collect_payloads": args.collect_payloads}
    if args.models:
        body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    for field, value in (("requests_per_minute", args.rpm), ("tokens_per_minute", args.tpm)):
        if value is not None:
            body[field] = value
    if args.budget is not None:
        body["budget"] = {"cost_units": args.budget, "period": args.period}
        if args.fallback:
            body["budget"]["fallback_model"] = args.fallback
    if args.expires_in_s is not None:
        body["expires_at"] = wall_clock() + args.expires_in_s
    return body


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")


def keys_table(keys: list[Mapping[str, Any]]) -> Table:
    table = Table("id", "name", "status", "models", "rpm", "tpm", "budget", "spent", "expires")
    for key in keys:
        budget = key.get("budget")
        table.add_row(
            key["id"],
            key["name"],
            key["status"],
            ",".join(key["models"]) if key.get("models") else "all",
            str(key.get("requests_per_minute") or "default"),
            str(key.get("tokens_per_minute") or "default"),
            f"{budget['cost_units']:g}/{budget['period']}"
            + (f" -> {budget['fallback_model']}" if budget.get("fallback_model") else "")
            if budget
            else "-",
            f"{budget.get('spent_cost_units', 0):.6g}" if budget else "-",
            _when(key.get("expires_at")),
        )
    return table


def usage_table(rows: list[Mapping[str, Any]]) -> Table:
    table = Table("day", "key", "model", "requests", "input tokens", "output tokens", "cost")
    for row in rows:
        table.add_row(
            row["day"], str(row["key_id"]), str(row["model"]), str(row["requests"]),
            str(row["input_tokens"]), str(row["output_tokens"]), f"{row['cost_units']:.6g}",
        )  # fmt: skip
    if rows:
        table.add_section()
        table.add_row(
            "total", "", "", str(sum(r["requests"] for r in rows)),
            str(sum(r["input_tokens"] for r in rows)), str(sum(r["output_tokens"] for r in rows)),
            f"{sum(r['cost_units'] for r in rows):.6g}",
        )  # fmt: skip
    return table


def run_keys(
    args: argparse.Namespace, client: httpx.Client, console: Console, wall_clock: Clock
) -> None:
    """One `edge keys` action; AdminError when the router refuses it."""
    if args.action == "create":
        made = admin_call(client, "POST", "/admin/keys", json=new_key_body(args, wall_clock))
        console.print(f"created {made['id']} ({made['name']}); its key, shown only now:")
        console.print(made["key"], highlight=False, soft_wrap=True)
    elif args.action == "list":
        console.print(keys_table(admin_call(client, "GET", "/admin/keys")["data"]))
    elif args.action == "revoke":
        admin_call(client, "DELETE", f"/admin/keys/{args.key_id}")
        console.print(f"revoked {args.key_id}: every router refuses it within seconds")
    else:
        rotated = admin_call(client, "POST", f"/admin/keys/{args.key_id}/rotate")
        console.print(f"rotated {rotated['id']}; the old key stops working. The new key:")
        console.print(rotated["key"], highlight=False, soft_wrap=True)


def run_usage(
    args: argparse.Namespace, client: httpx.Client, console: Console, wall_clock: Clock
) -> None:
    params: dict[str, Any] = {"since": wall_clock() - args.since_s}
    if args.key:
        params["key_id"] = args.key
    if args.model:
        params["model"] = args.model
    console.print(usage_table(admin_call(client, "GET", "/admin/usage", params=params)["data"]))


def add_keys_parser(
    commands: Any, router_options: Callable[[argparse.ArgumentParser], None], duration: Any
) -> None:
    keys = commands.add_parser(
        "keys", help="virtual keys: create, list, revoke, rotate",
        description="The gateway's virtual keys through the router's admin API (key: "
        "EDGE_ADMIN_KEY). Only a key's hash is stored: its secret is printed once.",
    )  # fmt: skip
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new key (printed once)")
    create.add_argument("name")
    create.add_argument("--models", help="comma-separated models it may use (default: all)")
    create.add_argument("--rpm", type=int, help="requests per minute (default: the config's)")
    create.add_argument("--tpm", type=int, help="tokens per minute (default: the config's)")
    create.add_argument("--budget", type=float, metavar="COST", help="cost units per period")
    create.add_argument("--period", choices=("day", "month"), default="month")
    create.add_argument("--fallback", metavar="MODEL", help="serves it past its budget")
    create.add_argument(
        "--expires", dest="expires_in_s", type=duration, metavar="DURATION", help="e.g. 30d"
    )
    create.add_argument(
        "--collect-payloads", action="store_true", help="keep its requests in the request log"
    )
    router_options(create)
    listing = actions.add_parser("list", help="every key, without secrets")
    router_options(listing)
    for action, summary in (("revoke", "refuse it from now on"), ("rotate", "a new secret")):
        parser = actions.add_parser(action, help=summary)
        parser.add_argument("key_id", metavar="ID")
        router_options(parser)

    usage = commands.add_parser(
        "usage", help="requests, tokens and cost by day, key and model",
        description="Usage totals from the request log (router /admin/usage).",
    )  # fmt: skip
    usage.add_argument("--key", help="one key id")
    usage.add_argument("--model", help="one model")
    usage.add_argument(
        "--since", dest="since_s", type=duration, default=7 * 86_400.0, metavar="DURATION",
        help="how far back (default 7d)",
    )  # fmt: skip
    router_options(usage)
