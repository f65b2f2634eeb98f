package coordinator

import "fmt"

// InFlightMode decides what a second caller does while the first holds the
// key. The zero value means InFlightWait.
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

// ParseInFlightMode parses "wait", "raise" or "run"; "" means "wait".
func ParseInFlightMode(s string) (InFlightMode, error) {
	switch InFlightMode(s) {
	case "", InFlightWait:
		return InFlightWait, nil
	case InFlightRaise, InFlightRun:
		return InFlightMode(s), nil
	}
	return "", fmt.Errorf("unknown in-flight mode %q: accepted values are wait, raise, run", s)
}

// String returns the mode's name; the zero value prints as "wait".
func (m InFlightMode) String() string {
	if m == "" {
		return string(InFlightWait)
	}
	return string(m)
}

// UnmarshalText parses the mode with ParseInFlightMode.
func (m *InFlightMode) UnmarshalText(b []byte) error {
	v, err := ParseInFlightMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the mode's name.
func (m InFlightMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// StorageErrorMode decides what a call does when the store fails before the
// action has run (reserving, or reading). The zero value means
// StorageErrorRun.
type StorageErrorMode string

// The on-storage-error modes.
const (
	// StorageErrorRun logs and counts the failure and runs the action
	// unprotected: availability over exactly-once. The default.
	StorageErrorRun StorageErrorMode = "run"
	// StorageErrorRaise logs and counts the failure and returns a
	// *StorageError without running the action: fail closed.
	StorageErrorRaise StorageErrorMode = "raise"
)

// ParseStorageErrorMode parses "run" or "raise"; "" means "run".
func ParseStorageErrorMode(s string) (StorageErrorMode, error) {
	switch StorageErrorMode(s) {
	case "", StorageErrorRun:
		return StorageErrorRun, nil
	case StorageErrorRaise:
		return StorageErrorRaise, nil
	}
	return "", fmt.Errorf("unknown on-storage-error mode %q: accepted values are run, raise", s)
}

// String returns the mode's name; the zero value prints as "run".
func (m StorageErrorMode) String() string {
	if m == "" {
		return string(StorageErrorRun)
	}
	return string(m)
}

// UnmarshalText parses the mode with ParseStorageErrorMode.
func (m *StorageErrorMode) UnmarshalText(b []byte) error {
	v, err := ParseStorageErrorMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// MarshalText returns the mode's name.
func (m StorageErrorMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }
