"""The reclaimer's admin page: ``{service prefix}admin``, Hub OAuth (or a Hub token), admins only.

Who holds which share on which node, how long each has been quiet, the warnings due, and
the log of what the reclaimer did. Names are shown to admins only: everyone else gets 403.
Plain HTML (no template engine): a table a person can read, and a link per user to the
Hub's admin page.
"""

from __future__ import annotations

import datetime
import html
from typing import Any

import tornado.web
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated

from .hubconfig import acts_as_admin


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _row(cells: list[Any], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in cells) + "</tr>"


def render(reclaimer: Any) -> str:
    now = reclaimer.clock()
    shares = [_row(["user", "server", "pod", "node", "cores", "memory MiB", "phase", "quiet min", "reclaim at",
                    "keeps left"], "th")]
    for (user, server), tracked in sorted(reclaimer.shares.items()):
        view = reclaimer.view(user, server)
        quiet = view.get("quietSeconds")
        shares.append(_row([user, server or "(default)", f"{tracked.usage.namespace}/{tracked.usage.pod}",
                            tracked.usage.node, tracked.usage.cores, tracked.usage.memory_mib, view["phase"],
                            "" if quiet is None else f"{quiet / 60:.0f}", _when(view.get("deadline")),
                            view.get("postponesLeft")]))
    log = [_row(["when", "user", "server", "step", "reason", "what happened"], "th")]
    for entry in reversed(reclaimer.journal):
        log.append(_row([_when(entry["at"]), entry["user"], entry["server"] or "(default)", entry["step"],
                         entry["reason"], entry["message"]]))
    queue = _queue(reclaimer.queue)
    problems = "".join(f"<li>{html.escape(url)}: {html.escape(problem)}</li>"
                       for url, problem in sorted(reclaimer.nodes.problems.items()))
    mode = " — DRY RUN: nothing is changed" if reclaimer.dry_run else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>GPU reclaimer</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}</style></head>
<body><h1>GPU shares: idle and reclaimed{html.escape(mode)}</h1>
<p>As of {_when(now)}; policy: idle after {reclaimer.idle_minutes:g} min, hoarding after
{reclaimer.hoard_minutes:g} min, {reclaimer.grace_minutes:g} min warning, action {html.escape(reclaimer.action)}.</p>
<h2>Shares watched</h2><table>{"".join(shares)}</table>
<h2>Waiting for a GPU</h2>{queue}
<h2>Nodes not answering</h2><ul>{problems or "<li>none</li>"}</ul>
<h2>Reclaim log</h2><table>{"".join(log)}</table>
</body></html>"""


def _queue(reader: Any) -> str:
    """The scheduler's queue (names: this page is for admins), or why it is not shown."""
    if reader is None:
        return "<p>Not shown: the reclaimer has no queue_url.</p>"
    if reader.latest is None:
        return f"<p>The scheduler's queue did not answer: {html.escape(reader.problem or 'not read yet')}.</p>"
    rows = [_row(["position", "pod", "cores", "memory MiB", "why it waits", "what would start now"], "th")]
    for entry in reader.latest.get("pending", []):
        other = entry.get("alternative") or {}
        rows.append(_row([entry.get("position"), f"{entry.get('namespace')}/{entry.get('pod')}", entry.get("cores"),
                          entry.get("memoryMib"), entry.get("why") or "fits now", other.get("text", "")]))
    free = [_row(["node", "whole cards free", "largest share free"], "th")]
    for node in reader.latest.get("nodes", []):
        share = node.get("largestShare") or {}
        free.append(_row([node.get("name"), node.get("wholeCardsFree"),
                          f"{share.get('cores')} % with {share.get('memoryMib')} MiB" if share else "none"]))
    return f"<table class=\"queue\">{''.join(rows)}</table><h3>Free room per node</h3><table>{''.join(free)}</table>"


class AdminPage(HubOAuthenticated, tornado.web.RequestHandler):
    def initialize(self, reclaimer: Any) -> None:
        self.reclaimer = reclaimer
        self.hub_auth = reclaimer.hub_oauth

    @tornado.web.authenticated
    def get(self) -> None:
        # HubOAuthenticated has let through only tokens with this service's access scope
        if not acts_as_admin(self.current_user or {}):
            raise tornado.web.HTTPError(403, "the GPU reclaimer's page is for admins")
        self.set_header("Cache-Control", "no-store")
        self.finish(render(self.reclaimer))


class OAuthCallback(HubOAuthCallbackHandler):
    """The Hub's OAuth redirect, finished with the reclaimer's own HubOAuth (its Hub URL, token and
    client), not the process-wide default one built from the environment."""

    def initialize(self, reclaimer: Any) -> None:
        self.hub_auth = reclaimer.hub_oauth
