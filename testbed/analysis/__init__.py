"""Reading results: statistics, comparisons and the gate, history, capacity, reports."""
