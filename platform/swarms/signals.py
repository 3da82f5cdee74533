"""What the swarms app announces. `swarm_state_changed` is sent inside the transaction that changed a
swarm's state or catalogue (swarm=the Swarm as saved); the pool connects to it in its AppConfig.ready()
and tells the swarm's open sockets once the transaction commits (sockets.closes)."""

from django.dispatch import Signal

swarm_changed = Signal()
