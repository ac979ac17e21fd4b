import { bannerText, countdown, ReclaimReply } from '../src/reclaim';

const warned: ReclaimReply = {
  state: 'watched',
  message: null,
  reclaim: {
    user: 'alice', server: '', dryRun: false, now: 1000, phase: 'warned', reason: 'idle', quietSeconds: 3600,
    deadline: 1900, secondsLeft: 900, postponesLeft: 1, postponeSeconds: 3600, action: 'cpu', lastReclaim: null
  }
};

describe('reclaim banner text', () => {
  it('counts down in minutes and seconds, never below zero', () => {
    expect(countdown(725.9)).toBe('12:05');
    expect(countdown(5)).toBe('0:05');
    expect(countdown(-3)).toBe('0:00');
  });

  it('warns with the countdown and what will happen', () => {
    expect(bannerText(warned, 61)).toBe(
      'This GPU share has been idle for 60 min. The server will be restarted without a GPU in 1:01 ' +
        'unless it computes again (your files stay).'
    );
  });

  it('says what happened after a reclaim, and nothing in a dry run or without a reclaimer', () => {
    const after: ReclaimReply = {
      ...warned,
      reclaim: {
        ...warned.reclaim!, phase: 'none', reason: null, secondsLeft: null, deadline: null,
        lastReclaim: { at: 900, reason: 'idle', action: 'cpu', message: 'GPU share reclaimed: idle for 60 min', outcome: 'done' }
      }
    };
    expect(bannerText(after, null)).toBe('GPU share reclaimed: idle for 60 min. Ask for a GPU again below when you need one.');
    expect(bannerText({ ...warned, reclaim: { ...warned.reclaim!, dryRun: true } }, 60)).toBeNull();
    expect(bannerText({ state: 'off', message: 'no reclaimer', reclaim: null }, null)).toBeNull();
  });
});
