"""Simulators for scheduling benchmarks: a latency-model engine, latency envs, a virtual clock,
a simulated tokenizer and trainer. Labelled as simulations wherever they are used; no product
package imports them."""
