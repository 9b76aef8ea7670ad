"""Codex documents from XDB: entries by reference resolved to stored text, condensed renditions made by the model."""
