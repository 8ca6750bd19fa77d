"""Stage actors and engines (``omni_actors.actors``): thinker, talker, code2wav hosts."""
