"""Grading a SWE episode: the patch policy and its content and config rules, the tests run with
swebench's log and our reporter as two judges, and the differential oracle beside them.
The door is `evaluate.evaluate_patch`: a diff in, a verdict out; nothing else grades."""
