"""The criteria judge: verdicts of checks (Dynalize's penalties, rubric criteria) on replies.

Penalties (`dynalize.penalties`), rubric rewards (`dynalize.rewards.rubric`) and evaluation all
use it: `judge` (the Judge), `verdicts` (checks and answers), `stats` (counters, failure window),
`prompting` (templates, fencing untrusted text), `saferegex` (regexes within a time budget),
`config` (its settings), `levels` (graded verdicts: ordered levels with values), `usage` (requests
and characters sent), and the benchmark protocols: `protocols` (their base), `healthbench` (one
call per criterion), `researchqa` (batches on a five-level scale).
"""
