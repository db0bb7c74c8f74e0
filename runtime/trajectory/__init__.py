"""Call graph of a session's engine calls -> training sequences; shared by the proxy and the learner."""
