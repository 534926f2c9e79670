"""Every committed generated file (families.py) and the generators that live nowhere else."""
