// Unit tests of the front-end models and the API client (no browser, no server).
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/src'],
  testRegex: 'src/__tests__/.*\\.spec\\.ts$',
  transform: {
    '^.+\\.tsx?$': [
      'ts-jest',
      {
        tsconfig: {
          module: 'commonjs',
          target: 'ES2018',
          esModuleInterop: true,
          strict: true,
          skipLibCheck: true,
          types: ['jest']
        }
      }
    ]
  }
};
