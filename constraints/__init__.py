"""Search spaces: decision variables and constraints, solved with OR-Tools CP-SAT."""
