"""A stand-in for Lightning (lightning.pytorch) for the CPU dry runs of
bench/gpu/ext_loops.sh on a machine whose torch has no Lightning; the GPU
machine uses the real package (ext_loops.sh puts bench/gpu/drystub on
PYTHONPATH only when DRY is set and the real one is missing)."""
__version__ = "0-drystub"
