# install_consumer's Python step: the package comes from the prefix given (argv[1]) and works.
import sys

import shardmm

assert shardmm.__file__.startswith(sys.argv[1]), f"shardmm imported from {shardmm.__file__}, not {sys.argv[1]}"
assert shardmm.Spec.parse("A[I_XY, J]", "X=2,Y=2").to_partition_spec() == "P(('X', 'Y'), None)"
