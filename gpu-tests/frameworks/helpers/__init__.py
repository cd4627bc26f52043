"""What the framework scripts in gpu-tests/frameworks share (not programs themselves: run.sh lists
only frameworks/*.py)."""
