"""Measuring in a real Triton: the served search (served_search/) chooses the operating point, `validate`
(validation/) proves the published model; both share the client calls (client.py), the answer check (answers.py),
which model a repository serves and whether the local server can serve it (target.py), and the prediction of what a
config serves at loads that were not measured (prediction.py). Neither imports the other."""
