package relay

// kick wakes one idle worker. A NOTIFY means rows may be waiting, and one
// claim takes them all (up to BatchSize), so waking every idle worker
// would only add empty claims — a transaction each — per commit. A kick
// sent while no worker waits is kept (kicks collapse into one) for the
// first worker to finish its batch; a worker whose claim came back full
// kicks another in turn, so a backlog brings in every worker.
type kick chan struct{}

func newKick() kick { return make(kick, 1) }

func (k kick) signal() {
	select {
	case k <- struct{}{}:
	default:
	}
}
