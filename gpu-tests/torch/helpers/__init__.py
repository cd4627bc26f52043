"""What the PyTorch scripts in gpu-tests/torch share (not programs themselves: run.sh lists only
torch/*.py)."""
