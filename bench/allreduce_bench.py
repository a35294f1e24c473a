"""The allreduce benchmark's old name: bench/collectives_bench.py --ops allreduce --many ''.

    python bench/allreduce_bench.py -np 2 -b 4 -e 64M     (any collectives_bench.py option)

Kept so that existing commands and notes still work; the timing, launch and
report logic live in collectives_bench.py only.
"""

import sys

import collectives_bench

if __name__ == "__main__":
    argv = ["--ops", "allreduce", "--many", "", *sys.argv[1:]]
    sys.exit(collectives_bench.main(argv, prog="allreduce_bench.py"))
