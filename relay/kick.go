package relay

// kick wakes one idle worker: one claim takes every waiting row, so waking
// all would add empty claims. A kick sent while no worker waits is kept
// (kicks collapse into one) for the first worker that does.
type kick chan struct{}

func newKick() kick { return make(kick, 1) }

func (k kick) signal() {
	select {
	case k <- struct{}{}:
	default:
	}
}
