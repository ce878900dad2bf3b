"""Page rendering: the Jinja2 environment (autoescaping on) and `render`."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from reflective_memory import __version__
from reflective_memory.serve.context import path_for, state

__all__ = ["templates", "render"]


def templates() -> jinja2.Environment:
    """The template environment: package templates, every value escaped."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reflective_memory.serve", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["path_for"] = path_for
    env.filters["num"] = lambda x, d=3: "–" if x is None else f"{x:.{d}f}"
    env.filters["tojson_pretty"] = lambda x: json.dumps(x, indent=2, default=str, sort_keys=True)
    env.filters["urlencode_dict"] = lambda d: urlencode(d)
    return env


def render(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    """Render a page template with the values every page uses."""
    st = state(request)
    who = getattr(request.state, "principal", None)
    env: jinja2.Environment = request.app.state.templates
    page = env.get_template(name).render(
        request=request,
        principal=who,
        csrf_token="" if who is None else st.policy.csrf_token(who),
        llm_name=st.llm_name,
        version=__version__,
        notice=None if who is None else st.take_flash(request.query_params.get("notice"), who.name),
        **ctx,
    )
    return HTMLResponse(page, status_code=status)
