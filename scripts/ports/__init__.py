"""The held-out comparison ports: airbench94 (airbench_port), airbench94_muon (airbench_muon_port, beside the
airbench94 port whose layers it shares, as its original imports them) and hiverge's record loop (hiverge_port). Each
stays as its original is, apart from course_lib, so that the course's recipes are checked against code they did not
shape (scripts.fidelity_cpu, scripts.fidelity_muon_cpu, scripts.gpu_capstone's dry run)."""
