"""What every stage uses: errors, atomic files, progress, typed-contract checks, subprocesses, caches."""
