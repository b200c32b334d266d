"""Where samples come from (sources), how their bytes become arrays (decode), and
the map-style Dataset that runs read → decode → augment with per-stage timing."""
