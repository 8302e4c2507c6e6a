"""The Temporal Web UI's pages, taken by headless chromium (`make screenshots`, issue 28).

Owns: driving the browser over the UI (`lab.screenshots.ui_pages`) and the command that writes
docs/screenshots/ from a private stack (`lab.screenshots.cli`, `payouts-lab screenshots`).
Must never: point the browser at a stack it did not start.
"""
