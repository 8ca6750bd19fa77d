"""Benchmarks behind ``omni-actors bench``: each returns a JSON-ready dict."""
