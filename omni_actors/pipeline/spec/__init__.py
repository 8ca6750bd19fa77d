"""A pipeline's definition: the YAML model, validated before anything starts.

``pipeline`` (``PipelineSpec``: stages, edges, deadlines), ``stage`` (one stage's
engine, placement and restart), ``cluster`` (scale-out on Ray), ``yaml_reader`` (the
file read within bounds), ``graph`` (the stages as a DAG), ``wiring`` (each edge checked
against its two engines' declarations), ``edge_paths`` (how each edge's tensors travel).
"""
