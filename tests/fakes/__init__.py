"""Stand-ins for parts that cannot run where a test or benchmark runs: the scripted vLLM engine and its
tokenisers and wire shapes. They speak the real protocol over a real socket; no component image installs them."""
