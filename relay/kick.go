package relay

// wakeSignal wakes one idle worker: one claim takes every waiting row, so
// waking all would add empty claims. Signals sent while no worker waits
// collapse into one, kept for the first worker that does.
type wakeSignal chan struct{}

func newWakeSignal() wakeSignal { return make(wakeSignal, 1) }

func (k wakeSignal) signal() {
	select {
	case k <- struct{}{}:
	default:
	}
}
