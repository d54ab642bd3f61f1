"""run: Dask runs, any cluster.  A run as a typed request, the cluster it uses, trials, the
monitor, the output it writes, the records it leaves, the live observer of every task, and the
in-worker probes.  The only wing that runs operators on Dask workers for their results."""
