"""Engines: the models a stage hosts, and how a pipeline finds them.

``contract`` is what a stage needs of an engine and what an engine declares (its
ports, arguments and kind); ``registry`` turns a pipeline's ``engine.kind`` into a
class. ``torch_engine``, ``stepped_engine`` and ``step_loop`` are the bases of
in-process torch engines; ``conversation`` is the state machine of engines that keep a
conversation, ``turn_marks`` the checks of its marks; ``scripted`` is the test
harness's engine; ``tiny_omni`` and ``vllm`` are model families.
"""
