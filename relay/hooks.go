package relay

// testHooks are callbacks a test sets on a Relay before Run, so that it can
// see or stall the relay at a given step. A Relay's hooks are nil in
// production, and every method is a no-op on nil.
type testHooks struct {
	afterPublish func()                    // after a batch's publishes, before its record
	claiming     func()                    // just before a claim, under the floor's lock
	sweeping     func()                    // just before a sweep's claim, outside it
	claimed      func(rows int, fl floors) // after a claim, under the floor's lock
	wakeLock     func()                    // just before a try of the wake lock that asks who holds it
	watch        func()                    // just before each of the listener's reads while it watches
	finishing    func()                    // in finishStranded's transaction, under the phase lock, before Finish
}

func (h *testHooks) onAfterPublish() {
	if h != nil && h.afterPublish != nil {
		h.afterPublish()
	}
}

func (h *testHooks) onClaiming() {
	if h != nil && h.claiming != nil {
		h.claiming()
	}
}

func (h *testHooks) onSweeping() {
	if h != nil && h.sweeping != nil {
		h.sweeping()
	}
}

func (h *testHooks) onClaimed(rows int, fl floors) {
	if h != nil && h.claimed != nil {
		h.claimed(rows, fl)
	}
}

func (h *testHooks) onWatch() {
	if h != nil && h.watch != nil {
		h.watch()
	}
}

func (h *testHooks) onWakeLock() {
	if h != nil && h.wakeLock != nil {
		h.wakeLock()
	}
}

func (h *testHooks) onFinishing() {
	if h != nil && h.finishing != nil {
		h.finishing()
	}
}
