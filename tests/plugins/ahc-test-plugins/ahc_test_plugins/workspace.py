"""An artifact injector: the current text of the file the agent edits (the path in AHC_TEST_WORKSPACE), as a
Codex document named for the file, on every request of a session."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from orchestrator.context_spec import CodexDoc, KarmaEntry
from orchestrator.injectors import InjectionRequest


class WorkspaceInjector:
    name = "workspace"

    def inject(self, request: InjectionRequest) -> Sequence[CodexDoc | KarmaEntry]:
        path = os.environ.get("AHC_TEST_WORKSPACE")
        if request.session_id is None or not path:
            return []
        file = Path(path)
        return [CodexDoc(id=f"workspace/{file.name}", text=file.read_text(), verbatim=True),
                KarmaEntry(id="workspace-session", text=f"Editing for session {request.session_id}.")]
