"""The op library: one module per op family (definition, shape function, kernel, constructor)."""
