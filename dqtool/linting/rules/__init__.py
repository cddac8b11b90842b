"""Model-level rule families, one module each; importing one registers its rules."""
