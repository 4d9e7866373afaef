"""Code generation: schedule -> LLVM IR -> object/assembly; the host runner for final checks."""
