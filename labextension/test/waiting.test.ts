import { alternativeText, positionText, switchBody, switchLabel, Waiting, whyText } from '../src/waiting';

const waiting: Waiting = {
  position: 3,
  waiting: 7,
  why: 'no card on any node has 50 % and 20 GiB free',
  cores: 50,
  memoryMib: 20480,
  alternative: { cores: 25, memoryMib: 8192, nodes: 3, text: 'a 25 % share with 8 GiB fits on 3 nodes' }
};

describe('the waiting view', () => {
  it('says where the request stands and why, in the extender words', () => {
    expect(positionText(waiting)).toBe('Position 3 of 7 waiting for a GPU.');
    expect(whyText(waiting)).toBe('Why: no card on any node has 50 % and 20 GiB free.');
    expect(alternativeText(waiting)).toBe('What would start now: a 25 % share with 8 GiB fits on 3 nodes.');
  });

  it('switches to the alternative share in cores and 256 MiB units', () => {
    expect(switchBody(waiting.alternative!)).toEqual({ cores: 25, memory: 32 });
    expect(switchLabel(waiting.alternative!)).toBe('Switch to 25 % of one card with 8 GiB');
    const whole = { cores: 200, memoryMib: 0, nodes: 1, text: '2 whole cards fits on 1 node' };
    expect(switchBody(whole)).toEqual({ cores: 200, memory: 0 });
    expect(switchLabel(whole)).toBe('Switch to 2 whole cards');
  });

  it('says plainly when nothing smaller would start either', () => {
    expect(alternativeText({ ...waiting, alternative: null })).toBe(
      'Nothing smaller would start now either; your request keeps its place.'
    );
  });
});
