"""Renderers: they format a Run (console, markdown); they never measure or analyse."""
