"""The app profiles of apps/ as the harness reads them: one place that loads apps/APP.toml
and fills in a template's placeholders, so that every server the harness starts without
lockstep (an unreplicated baseline) gets the command and files `cluster up --app` would
give a replica.

The placeholders are those of guard/server.cc's SubstituteCommand (apps/README.md):
{port} the server's port, {dir} its data directory, {host} the address it listens on.
Render every profile string through render(): a placeholder left in a command is a
baseline that fails to start (clamd "getaddrinfo failed", tarantool "Incorrect value for
option 'listen'")."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS_DIR = ROOT / "apps"
DEFAULT_HOST = "127.0.0.1"  # a loopback cluster's replica address, as in cluster.toml


def load(app):
    """apps/APP.toml as a dict."""
    return tomllib.loads((APPS_DIR / f"{app}.toml").read_text())


def render(text, port, d, host=DEFAULT_HOST):
    """text with {port}, {dir} and {host} filled in (str, or bytes for a profile's files)."""
    pairs = {"{port}": str(port), "{dir}": str(d), "{host}": host}
    if isinstance(text, bytes):
        for k, v in pairs.items():
            text = text.replace(k.encode(), v.encode())
        return text
    for k, v in pairs.items():
        text = text.replace(k, v)
    return text


def variant(app, work, text_of=lambda text: text, name=None):
    """apps/APP.toml, changed by text_of(text), written into work/ (as NAME.toml) with its
    `files` beside it, where `cluster up --app PATH` looks for them: a profile with one
    feature turned off or on. Returns the path."""
    text = text_of((APPS_DIR / f"{app}.toml").read_text())
    files = re.search(r'(?m)^files = "(.*)"$', text)
    for f in files.group(1).split(",") if files else ():
        dst = Path(work) / f.strip()
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((APPS_DIR / f.strip()).read_bytes())
    path = Path(work) / f"{name or app}.toml"
    path.write_text(text)
    return str(path)
