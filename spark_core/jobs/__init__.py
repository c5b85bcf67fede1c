"""Spark applications run with spark-submit (``site.py``: one per site)."""
