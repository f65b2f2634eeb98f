package coordinator

import "fmt"

// InFlightMode decides what a second caller does while the first holds the
// key; it is set with WithInFlight (IDEMPOTENCY_IN_FLIGHT in the fx module).
// The zero value means InFlightWait.
type InFlightMode string

// The in-flight modes.
const (
	// InFlightWait waits for the holder's result and returns it; if the
	// reservation disappears it reserves and runs itself; past the wait bound
	// it returns ErrInProgress. The default.
	InFlightWait InFlightMode = "wait"
	// InFlightRaise returns ErrInProgress at once.
	InFlightRaise InFlightMode = "raise"
	// InFlightRun takes no reservation: it reads, runs the action, and writes
	// the result if the key is still absent; a collision adopts the winner's
	// result.
	InFlightRun InFlightMode = "run"
)

// parse returns the mode m names, with "" meaning InFlightWait.
func (m InFlightMode) parse() (InFlightMode, error) {
	switch m {
	case "", InFlightWait:
		return InFlightWait, nil
	case InFlightRaise, InFlightRun:
		return m, nil
	}
	return "", fmt.Errorf("unknown in-flight mode %q: accepted values are wait, raise, run", string(m))
}

// String returns the mode's name; the zero value prints as "wait".
func (m InFlightMode) String() string {
	if m == "" {
		return string(InFlightWait)
	}
	return string(m)
}

// UnmarshalText parses "wait", "raise" or "run"; empty text means "wait".
// It returns an error naming the accepted values for anything else.
func (m *InFlightMode) UnmarshalText(b []byte) error {
	v, err := InFlightMode(b).parse()
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the mode's name.
func (m InFlightMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// OnStorageErrorMode decides what a call does when the store fails before
// the action has run (reserving, or reading); it is set with
// WithOnStorageError (IDEMPOTENCY_ON_STORAGE_ERROR in the fx module). The
// zero value means OnStorageErrorRun.
type OnStorageErrorMode string

// The on-storage-error modes.
const (
	// OnStorageErrorRun logs and counts the failure and runs the action
	// unprotected: availability over exactly-once. The default.
	OnStorageErrorRun OnStorageErrorMode = "run"
	// OnStorageErrorRaise logs and counts the failure and returns a
	// *StorageError without running the action: fail closed.
	OnStorageErrorRaise OnStorageErrorMode = "raise"
)

// parse returns the mode m names, with "" meaning OnStorageErrorRun.
func (m OnStorageErrorMode) parse() (OnStorageErrorMode, error) {
	switch m {
	case "", OnStorageErrorRun:
		return OnStorageErrorRun, nil
	case OnStorageErrorRaise:
		return m, nil
	}
	return "", fmt.Errorf("unknown on-storage-error mode %q: accepted values are run, raise", string(m))
}

// String returns the mode's name; the zero value prints as "run".
func (m OnStorageErrorMode) String() string {
	if m == "" {
		return string(OnStorageErrorRun)
	}
	return string(m)
}

// UnmarshalText parses "run" or "raise"; empty text means "run". It returns
// an error naming the accepted values for anything else.
func (m *OnStorageErrorMode) UnmarshalText(b []byte) error {
	v, err := OnStorageErrorMode(b).parse()
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the mode's name.
func (m OnStorageErrorMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }
