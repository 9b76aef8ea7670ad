"""Draw the README's screenshots of the experience browser from a real model's session.

    .venv/bin/python scripts/ui_screenshots.py [--out docs/images]

Starts `ahc serve` on the real model (SmolLM2-135M-Instruct, configs/cpu-small.yaml, its concept lens on;
`make setup` fetches both), runs a six-turn session through the chat door with Identity, Codex and Karma
as a discovery agent sends them, then screenshots the sessions list and that session with Debian's
Chromium under Playwright. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from playwright.sync_api import sync_playwright

from bench.servers import REAL_CONFIG, REAL_MODEL, start_server
from server.cluster.server_process import ServerProcess

KEY = "sk-screenshots"
SESSION = "explorer-42"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IDENTITY = "You are a careful physicist who studies a ring of cells. Answer in two short sentences."
CODEX = [{"id": "rules-so-far", "text": (
    "Observed rules of the ring universe.\n"
    "1. Each cell is 0 or 1; the ring has 64 cells and wraps around.\n"
    "2. A lone 1 moves one cell to the right each tick.\n"
    "3. Two 1s that meet annihilate and leave 0s.\n"
    "4. A block of three 1s stays still.\n"
    "Open questions: what happens when a moving 1 hits a still block; is the rule left-right symmetric?")}]
QUESTIONS = [
    "What did the last experiment show?",
    "Propose an experiment to test collisions.",
    "Does a lone cell ever turn back?",
    "Which rule is the least certain?",
    "Summarise what is known in one sentence.",
    "What should the next experiment be?",
]
KARMA = [
    [],
    [{"id": "k1", "text": "Colliding two moving 1s left an empty ring."}],
    [{"id": "k1", "text": "Colliding two moving 1s left an empty ring."},
     {"id": "k2", "text": "A moving 1 that met a still block was absorbed."}],
]


def run_session(server: ServerProcess) -> None:
    client = server.client(timeout=600)
    model = client.models.list().data[0].id
    for turn, question in enumerate(QUESTIONS):
        context = {"session_id": SESSION, "identity": IDENTITY, "codex": CODEX,
                   "karma": KARMA[min(turn // 2, len(KARMA) - 1)]}
        client.chat.completions.create(model=model, max_tokens=48, temperature=0,
                                       messages=[{"role": "user", "content": question}],
                                       extra_body={"context": context})
    side_sessions(client, model)
    with server.http() as http:
        deadline = time.monotonic() + 30
        while len(http.get(f"/v1/xdb/sessions/{SESSION}/turns").json()["turns"]) < len(QUESTIONS):
            if time.monotonic() > deadline:
                raise RuntimeError("the session's turns were not recorded")
            time.sleep(0.2)


def side_sessions(client: openai.OpenAI, model: str) -> None:
    """Two more agents beside it, for the list: one naming its session (the server keeps its State), one
    resending its history with no id (its session inferred)."""
    for question in ("Name one property of a ring of cells.", "Why does it matter?"):
        client.chat.completions.create(model=model, max_tokens=24, temperature=0,
                                       messages=[{"role": "user", "content": question}],
                                       extra_body={"context": {"session_id": "reviewer-7", "identity": IDENTITY}})
    history: list[Any] = []
    for question in ("What is a cellular automaton?", "Give an example."):
        history.append({"role": "user", "content": question})
        reply = client.chat.completions.create(model=model, max_tokens=24, temperature=0, messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


def screenshot(server: ServerProcess, out: Path, chromium: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 340})
            page.goto(f"{server.base_url}/ui/")
            page.locator("#key-form").wait_for(state="visible")
            page.fill("#api-key", KEY)
            page.click("#key-form button[type=submit]")
            page.locator(f'#sessions tr[data-session="{SESSION}"]').wait_for()
            page.screenshot(path=str(out / "ui-sessions.png"))
            page.click(f'#sessions tr[data-session="{SESSION}"] a')
            page.set_viewport_size({"width": 1200, "height": 1400})
            page.locator(".turns section.turn").nth(len(QUESTIONS) - 1).wait_for()
            for turn in range(1, 5):  # the turns in view load their tokens, coloured by the lens
                page.locator(f"#turn-{turn} .tok[data-concept]").first.wait_for()
            page.screenshot(path=str(out / "ui-session.png"))
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "xdb", model=REAL_MODEL, config=REAL_CONFIG, api_key=KEY)
        try:
            run_session(server)
            screenshot(server, args.out, args.chromium)
        finally:
            server.stop()
    print(f"wrote {args.out / 'ui-sessions.png'} and {args.out / 'ui-session.png'}")


if __name__ == "__main__":
    main()
