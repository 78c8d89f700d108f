"""The EAGLE draft step (first pass over the verified tokens plus the k - 1 chained
passes) replayed as one CUDA graph per decode shape."""
