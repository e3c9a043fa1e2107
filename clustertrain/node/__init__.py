"""The node side: what a job's batch script starts on the nodes of its allocation.

supervisor  the batch script's one command: the node check, the step, each decision carried out
policy      the fault-tolerance policy as pure decisions (restart, spare, requeue, end)
watchdog    beside each step: a hang found from the heartbeats, every rank's stack, a lost node
beats       the ranks' heartbeats, read (the watchdog's poll, `clustertrain top`)
rollcall    with spare nodes: which nodes still answer, and which to train on next
nodecheck   each node's check before training (the head node's address, the rendezvous port)
qualify     qualification's schedule and verdict; torchprobe and sockprobe (with wire) measure
netif       the interface on a node's route to the head node

Nothing here imports the submit side.
"""
