// Re-render a component whenever a model's `changed` signal fires.

import { ISignal } from '@lumino/signaling';
import { useEffect, useReducer } from 'react';

export function useChanged<T>(signal: ISignal<T, void>): void {
  const [, bump] = useReducer((n: number) => n + 1, 0);
  useEffect(() => {
    const slot = () => bump();
    signal.connect(slot);
    return () => {
      signal.disconnect(slot);
    };
  }, [signal]);
}

/** Re-render every `ms` milliseconds (elapsed times keep counting between polls). */
export function useTick(ms: number): number {
  const [now, setNow] = useReducer((_: number, t: number) => t, Date.now());
  useEffect(() => {
    const id = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(id);
  }, [ms]);
  return now;
}
