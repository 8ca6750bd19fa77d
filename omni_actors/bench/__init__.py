"""Benchmarks behind ``omni-actors bench``.

Each target module exposes one coroutine that measures and returns a JSON-ready dict;
the CLI runs it (on uvloop when installed) and prints it. Benchmarks are commands, never
timed assertions in tests.
"""
