"""Application layer of synchrony: CLI, offline analysis, live WebRTC server, UI and load testing."""
