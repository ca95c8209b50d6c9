"""gpuready validators: run tools on GPU nodes, parse, judge against SKU profiles, report."""
