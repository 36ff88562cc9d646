"""Search: candidate regions and strategies (candidates.py), the CP-SAT plan search
(solver.py) and its exact oracle (exact.py)."""
from __future__ import annotations

from kitsune_dse.search.candidates import (STRATEGIES, Candidate, CandidateSet, atom_chain,
                                           build_candidates)
from kitsune_dse.search.exact import solve_exact
from kitsune_dse.search.solver import OBJECTIVES, SolverResult, solve

__all__ = ["STRATEGIES", "OBJECTIVES", "Candidate", "CandidateSet", "SolverResult", "atom_chain",
           "build_candidates", "solve", "solve_exact"]
