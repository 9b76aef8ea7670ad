"""MkDocs hook: adds the reference pages, generated from the code by `ahc.docs_reference`, to the site's
files at build time (they are never written into docs/)."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: MkDocsConfig) -> Files:
    # This checkout's code, whichever copy of AHC the environment has installed.
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from ahc.docs_reference import PAGES

    for uri, render in PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
