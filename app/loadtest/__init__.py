"""The load-test kit: simulated WebRTC peers, impaired links, rounds, figures, reports, test media."""
