"""model: what the measurements say.  The mean basis and kernel, the GP ``MemoryModel`` and its
file, its fit (NumPy posterior, torch ML-II), the statistics it rests on, and a pipeline's model
composed from its members'.  Pure NumPy at prediction time (torch only to fit)."""
