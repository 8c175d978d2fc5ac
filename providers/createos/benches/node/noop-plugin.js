'use strict';
// A no-op sandbox provider plugin: the Node.js equivalent of the component's
// `describe`, returning a static description and doing nothing else.
module.exports = {
  describe() {
    return {
      driverKey: 'noop',
      displayName: 'No-op provider',
      version: '0.1.0',
      requestSpacingMs: 0,
      secrets: [],
    };
  },
};
