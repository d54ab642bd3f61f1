"""measure: what things cost.  The kernel high-water mark, the fork server and the profile of
one operator at one shape in an isolated child; inside Dask workers, a task's high-water mark,
the allocator setting of the profiles, and an idle worker's baseline."""
