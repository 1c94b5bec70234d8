"""What a run leaves a person: its folder read back (:mod:`.data`), the HTML report (:mod:`.html`)
and the exported package (:mod:`.export`)."""

from __future__ import annotations

from kfoundry.core.report.data import RunData, RunFolderError, load_run
from kfoundry.core.report.html import render_report, write_report

__all__ = ["RunData", "RunFolderError", "load_run", "render_report", "write_report"]
