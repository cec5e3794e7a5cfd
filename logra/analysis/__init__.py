"""Tables, verdicts with intervals, figures and the report, from the workflow's results files.
Imports pandas, matplotlib and the shared modules only: no torch."""
